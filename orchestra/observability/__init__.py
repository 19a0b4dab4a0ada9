"""What an operator sees of a running server: metrics (`metrics`), traces (`tracing`),
log lines (`logs`) and the request and run a line belongs to (`context`).

The rest of the code calls the small functions here; nothing here imports the engine,
the services or the web layer, so instrumenting a module never drags another in.
"""
