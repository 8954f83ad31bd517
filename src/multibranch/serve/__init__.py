"""`multibranch serve`: an HTTP server (FastAPI) for a translation model or a classifier, with
micro-batching across requests.

Modules: limits (ServeLimits), engine (torch / CTranslate2 translation engines and the classifier
engine, one model copy), batcher (the
bounded queue and the single worker that owns the engine), metrics (Prometheus), app (the FastAPI
factory). Import `multibranch.serve.app.create_app` to embed the server.
"""
