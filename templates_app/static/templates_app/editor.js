/* The template editor's live parts, without dependencies: the SMS counter and the preview beside the form.
   smsInfo() is a port of templates_app/sms.py (tests/staff/test_admin_browser.py checks both agree). */
(function () {
  "use strict";
  var BASIC = "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞ\x1bÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?" +
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà";
  var EXT = "\f^{}\\[~]|€";

  function segments(costs, single, multi) {
    var total = costs.reduce(function (a, b) { return a + b; }, 0);
    if (total <= single) { return total ? 1 : 0; }
    var count = 1, used = 0;
    costs.forEach(function (cost) {
      if (used + cost > multi) { count += 1; used = 0; }  // never split an escape or a surrogate pair
      used += cost;
    });
    return count;
  }

  function smsInfo(text) {
    var chars = Array.from(text);  // code points, as Python iterates a str
    var gsm = chars.every(function (c) { return BASIC.indexOf(c) >= 0 || EXT.indexOf(c) >= 0; });
    var costs = chars.map(function (c) {
      return gsm ? (EXT.indexOf(c) >= 0 ? 2 : 1) : (c.codePointAt(0) > 0xFFFF ? 2 : 1);
    });
    var units = costs.reduce(function (a, b) { return a + b; }, 0);
    return gsm ? { encoding: "gsm7", units: units, segments: segments(costs, 160, 153) }
               : { encoding: "ucs2", units: units, segments: segments(costs, 70, 67) };
  }
  window.notifierSmsInfo = smsInfo;

  function el(tag, text, attrs) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = text; }
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    return node;
  }

  function showErrors(errors) {
    document.querySelectorAll(".tpl-field-errors").forEach(function (ul) { ul.textContent = ""; });
    Object.keys(errors).forEach(function (name) {
      var ul = document.getElementById("errors-" + name) || document.getElementById("errors-__all__");
      errors[name].forEach(function (message) { ul.appendChild(el("li", message)); });
    });
  }

  function showPreview(channels) {
    var out = document.getElementById("preview-output");
    out.textContent = "";
    channels.forEach(function (channel) {
      var box = el("div", null, { "class": "tpl-preview-channel", id: "preview-" + channel.channel });
      box.appendChild(el("h3", channel.channel + " (locale " + channel.locale + ")"));
      channel.parts.forEach(function (part) {
        box.appendChild(el("h4", part.name));
        box.appendChild(el("pre", part.text, { "class": "preview-part", "data-part": channel.channel + "." + part.name }));
        if (part.html && part.text) {
          var frame = el("iframe", null, { sandbox: "" });  // no script, no access to the admin
          frame.srcdoc = part.text;
          box.appendChild(frame);
        }
        if (part.sms) {
          box.appendChild(el("p", part.sms.units + " units · " + part.sms.encoding + " · " + part.sms.segments + " segment(s)",
                             { "class": "tpl-sms" }));
        }
      });
      out.appendChild(box);
    });
  }

  function updatePreview() {
    var panel = document.getElementById("tpl-preview");
    var form = panel.closest("form");
    var status = document.getElementById("preview-button");
    status.disabled = true;
    fetch(panel.dataset.url, { method: "POST", body: new FormData(form), credentials: "same-origin" })
      .then(function (response) { return response.json(); })
      .then(function (data) { showErrors(data.errors || {}); showPreview(data.channels || []); })
      .catch(function (err) { showErrors({ __all__: ["Preview failed: " + err] }); })
      .finally(function () { status.disabled = false; });
  }

  function bindSmsCounter(area) {
    var info = document.querySelector('[data-sms-for="' + area.id + '"]');
    if (!info) { return; }
    var update = function () {
      var r = smsInfo(area.value);
      info.querySelector(".sms-chars").textContent = r.units;
      info.querySelector(".sms-encoding").textContent = r.encoding;
      info.querySelector(".sms-segments").textContent = r.segments;
    };
    area.addEventListener("input", update);
    update();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("textarea[data-sms]").forEach(bindSmsCounter);
    var button = document.getElementById("preview-button");
    if (button) { button.addEventListener("click", updatePreview); }
  });
})();
