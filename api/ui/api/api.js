// The API reference page: Swagger UI (vendored from npm into
// ../vendor/swagger-ui by scripts/vendor-swagger-ui.sh) rendering the
// server's own /openapi.json. A key signed in to the dashboard in this
// browser tab is put in the "Authorize" dialog, so "Try it out" calls the
// API with it; otherwise the dialog asks for one ("Bearer <key>"). Only
// the read routes (GET) can be tried here: with an admin key signed in, a
// period close or a new price book must not be one click away.
"use strict";

function fail(text) {
  const m = document.getElementById("message");
  m.textContent = text;
  m.hidden = false;
  document.body.dataset.state = "error";
}

async function start() {
  // The document is fetched here rather than by Swagger UI, so that a
  // failure is shown on the page (and on body[data-state]).
  let spec;
  try {
    const resp = await fetch("/openapi.json");
    if (!resp.ok) throw new Error(`GET /openapi.json answered ${resp.status}`);
    spec = await resp.json();
  } catch (err) {
    fail(`The API document could not be loaded: ${err.message}`);
    return;
  }
  const ui = SwaggerUIBundle({
    spec,
    dom_id: "#swagger-ui",
    deepLinking: true,
    // Never send the document to swagger.io's online validator: the page
    // makes no request outside this server.
    validatorUrl: null,
    defaultModelsExpandDepth: 0,
    displayOperationId: true,
    supportedSubmitMethods: ["get"],
    onComplete: () => {
      const key = sessionStorage.getItem("tokenmeter.key");
      if (key) ui.preauthorizeApiKey("ApiKey", "Bearer " + key);
      document.body.dataset.state = "ready";
    },
  });
}

start();
