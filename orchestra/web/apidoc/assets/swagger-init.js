// orchestra: start Swagger UI on the served document (no validator badge: it calls an outside host).
window.ui = SwaggerUIBundle({
  url: "/api/v1/docs/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
});
