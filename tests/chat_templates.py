"""Chat templates that take tools, one in each family's calling format, written for the tests
(the shapes of Qwen's, Llama 3.1's and Mistral's, not their text): put on the embedded target's
tokenizer, they make checkpoints of each family's format offline (tools_tokenizer)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "default" / "target"

# Qwen2.5 / Qwen3 / Hermes: the tools in the system turn, calls in <tool_call> tags, answers
# in <tool_response> tags of a user turn.
HERMES = """
{%- if tools or messages[0].role == 'system' %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}
{%- if tools %}Functions you may call, one JSON signature a line:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
To call one, answer <tool_call>{"name": NAME, "arguments": OBJECT}</tool_call>.
{%- endif %}<|im_end|>
{% endif %}
{%- for m in messages if m.role != 'system' %}
{%- if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}
{%- for call in m.tool_calls or [] %}
<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# Llama 3.1 / 3.2: the tools in a system header, a call as the whole message after
# <|python_tag|>, answers in an ipython turn.
LLAMA3 = """
{%- if tools %}<|start_header_id|>system<|end_header_id|>

Environment: ipython
Answer a function call as JSON {"name": function name, "parameters": arguments}, nothing else.
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>

{% if m.tool_calls %}<|python_tag|>
{%- for call in m.tool_calls %}{{ {"name": call.function.name, "parameters": call.function.arguments} | tojson }}
{%- if not loop.last %}; {% endif %}{% endfor %}<|eom_id|>
{%- else %}{{ m.content }}<|eot_id|>{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

# Mistral: the tools before the last user turn, calls as one JSON list after [TOOL_CALLS].
MISTRAL = """
{%- for m in messages %}
{%- if m.role == 'user' %}
{%- if tools and loop.last %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif -%}
[INST]{{ m.content }}[/INST]
{%- elif m.role == 'system' %}{{ m.content }}

{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ {"call_id": m.tool_call_id, "content": m.content} | tojson }}[/TOOL_RESULTS]
{%- elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}</s>
{%- else %}{{ m.content }}</s>
{%- endif %}
{%- endfor %}"""

TEMPLATES = {"hermes": HERMES, "llama3_json": LLAMA3, "mistral": MISTRAL}


def tools_tokenizer(path: Path, template: str, special: tuple[str, ...] = ()) -> Path:
    """The embedded target's tokenizer files in `path` with `template` as the chat template and
    `special` added as special tokens (new ids past the vocabulary, as a family's markers are)."""
    path.mkdir(parents=True, exist_ok=True)
    for f in TARGET.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, path / f.name)
    if special:
        from tokenizers import AddedToken, Tokenizer
        raw = Tokenizer.from_file(str(path / "tokenizer.json"))
        raw.add_special_tokens([AddedToken(t, special=True) for t in special])
        raw.save(str(path / "tokenizer.json"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path
