"""Provider adapters, one module per provider, all behind `channels_app.providers.base.Provider`."""
