// Swagger UI for /docs, started from a file: the page runs under the dashboard's
// Content-Security-Policy, which allows no inline script.
window.addEventListener("DOMContentLoaded", () => {
  const el = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: el.dataset.openapiUrl,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    validatorUrl: null, // the default asks validator.swagger.io: nothing leaves this host
    presets: [SwaggerUIBundle.presets.apis],
  });
});
