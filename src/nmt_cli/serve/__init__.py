"""`nmt serve` (the `serve` extra): engine.py feeds the decoding engine from concurrent requests (no web package),
service.py checks LibreTranslate's requests and shapes the answers (no web package), app.py is the Starlette app,
server.py runs it under uvicorn with a graceful stop. Only app.py and server.py import the web stack."""
