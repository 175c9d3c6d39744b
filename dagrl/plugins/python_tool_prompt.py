"""Row transform for tool-calling runs (`external_plugins=[dagrl.plugins.python_tool_prompt]`):
puts a system message describing the sandboxed `python` tool in front of every row's prompt, with
its JSON schema and the Hermes call format the `hermes` parser reads. Used by
conf/experiment/multi_turn/python_math.yaml.

dagrl renders prompts with the model's chat template once, in the data layer; a template that
takes `tools=` (Qwen2.5, Qwen3) would render the schema itself, but the message below works with
any template and says the same thing.
"""

from __future__ import annotations

import json

from dagrl.data.transforms import register_row_transform
from dagrl.tools.sandbox import python_tool

SYSTEM = (
    "You can run Python code to help with the problem. The tool is described by this JSON schema:\n"
    "{schema}\n"
    "To run code, write one call per block in exactly this form and stop:\n"
    '<tool_call>{{"name": "python", "arguments": {{"code": "print(2 + 2)"}}}}</tool_call>\n'
    "The program's output comes back in the next message. When you know the answer, write it "
    'after "####" without calling the tool.'
)


@register_row_transform
def add_python_tool_prompt(row: dict) -> dict:
    if any(m.get("role") == "system" for m in row["prompt"]):
        return row
    schema = json.dumps(python_tool().schema())
    return {**row, "prompt": [{"role": "system", "content": SYSTEM.format(schema=schema)}, *row["prompt"]]}
