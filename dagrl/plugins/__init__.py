"""Plugins shipped with dagrl, loaded only when a run names their module in `external_plugins`
(e.g. `external_plugins=[dagrl.plugins.python_tool_prompt]`): importing one registers what it
adds (a row transform) for the whole process, so nothing in dagrl imports them itself. Presets
name them by module, never by a path, so an installed dagrl runs them from any directory."""
