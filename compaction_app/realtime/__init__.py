"""Realtime: pushing ledger changes to websocket watchers.

`broadcast` is the one helper the rest of the code pushes through; `layers` holds the channel
layers the settings name; `consumers` are the JSON websocket endpoints, `ws_auth` authenticates
their connections, and `routing` maps the websocket URLs (the dashboard's HTML consumers live
in compaction_app/dashboard/consumers.py)."""
