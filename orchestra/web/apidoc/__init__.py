"""The OpenAPI 3.1 document and its offline docs pages.

`operation.documented` puts an operation's description next to its handler;
`document.build_document(app)` walks the router and turns those descriptions, the
request models that validate the bodies and the response models of `models` into one
document; `ui` serves it with Swagger UI and ReDoc from files shipped in the package.
"""
