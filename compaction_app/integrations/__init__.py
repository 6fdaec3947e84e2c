"""Integrations usable outside the Django process: the Python client and the LangGraph node.

Nothing here imports Django: a LangGraph app or an agent script is not a Django app.
"""
