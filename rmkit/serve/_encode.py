"""Text and conversations to token ids, through the data contract (`rmkit.data.tokenize`).

The fallback below implements the same contract only until the data branch is merged; delete it then.
"""

from __future__ import annotations

try:
    from rmkit.data.tokenize import encode_conversation, encode_text
except ImportError:  # pragma: no cover - removed once rmkit.data.tokenize exists

    def encode_text(tokenizer, text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=True).input_ids)

    def encode_conversation(tokenizer, messages: list[dict]) -> list[int]:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            return list(tokenizer(text, add_special_tokens=False).input_ids)
        names = {"user": "User", "assistant": "Assistant", "system": "System"}
        text = "\n".join(f"{names.get(m['role'], m['role'])}: {m['content']}" for m in messages)
        return encode_text(tokenizer, text)


__all__ = ["encode_conversation", "encode_text"]
