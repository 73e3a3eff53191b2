"""The optional local web page (docs/web.md): a small Starlette app served by uvicorn on a thread of
its own, reading only the daemon's typed status; never on a pipeline's path."""
