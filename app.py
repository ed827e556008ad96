"""Entry point for `flask` run from the source tree (`flask llmgw ...`)."""
from llmgw import create_app

app = create_app()
