/** The client's version: the service's release it speaks to (package.json repeats it; a test checks the two). */
export const VERSION = "0.1.0-dev.0";
