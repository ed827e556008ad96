"""WSGI entry point for gunicorn: `gunicorn -c deploy/gunicorn.conf.py wsgi:app`."""
from llmgw import create_app

app = create_app()
