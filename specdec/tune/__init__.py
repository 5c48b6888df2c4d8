"""`specdec tune`: measure a checkpoint pair on the user's own prompts and say whether, and with
how many draft tokens, speculation pays (docs/tune.md)."""
