// ReDoc for /redoc, started from a file (no inline script under the Content-Security-Policy).
window.addEventListener("DOMContentLoaded", () => {
  const el = document.getElementById("redoc");
  Redoc.init(el.dataset.openapiUrl, { disableSearch: false, hideDownloadButton: false }, el);
});
