"""The shared library every app imports: errors, bulk writes, group commit, control queues, the live layer,
the request context and the API toolkit.

It imports no app and nothing of the project's top (`gpucloud`: settings,
URLs, the ASGI, WSGI and Celery applications, the command line), so the
structure has arrows pointing one way: the top imports the apps and this
library, the apps import this library (import-linter holds both).
"""
