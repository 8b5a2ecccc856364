"""Speculative decoding's drafters (a draft model, prompt lookup and its shadow) that propose the tokens the target
verifies."""
