"""Check an OpenAI request body before anything is reserved or sent: a 400 that names the field.

Unknown fields are refused rather than passed on, so a typo ('max_token') is reported instead
of silently ignored by the engine. The engines' own sampling extras are known fields too.
"""

COMMON = {"model", "user", "stream", "stream_options", "metadata", "store", "service_tier", "seed",
          "temperature", "top_p", "n", "stop", "presence_penalty", "frequency_penalty", "logit_bias",
          "logprobs", "top_logprobs", "max_tokens", "max_completion_tokens"}
# Sampling options llama.cpp, vLLM and SGLang accept beyond OpenAI's.
ENGINE_EXTRAS = {"top_k", "min_p", "typical_p", "repeat_penalty", "repeat_last_n", "mirostat",
                 "mirostat_tau", "mirostat_eta", "grammar", "json_schema", "cache_prompt", "n_probs",
                 "samplers", "dry_multiplier", "dry_base", "dry_allowed_length", "xtc_probability",
                 "xtc_threshold", "id_slot", "min_tokens", "ignore_eos", "skip_special_tokens",
                 "repetition_penalty", "chat_template_kwargs", "guided_json", "guided_regex",
                 "guided_choice", "guided_grammar", "length_penalty", "best_of", "use_beam_search"}
FIELDS = {
    "chat/completions": COMMON | ENGINE_EXTRAS | {
        "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "functions",
        "function_call", "modalities", "audio", "prediction", "reasoning_effort", "web_search_options"},
    "completions": COMMON | ENGINE_EXTRAS | {"prompt", "suffix", "echo", "best_of"},
    "embeddings": {"model", "input", "encoding_format", "dimensions", "user"},
}
REQUIRED = {"chat/completions": "messages", "completions": "prompt", "embeddings": "input"}
NUMBERS = {"temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p", "top_k",
           "repeat_penalty", "typical_p"}
WHOLE = {"max_tokens", "max_completion_tokens", "n", "seed", "top_logprobs", "dimensions"}


def problems(path, body):
    """Return (message, param) for the first thing wrong with body, or None when it is fine."""
    unknown = sorted(set(body) - FIELDS[path])
    if unknown:
        return f"Unrecognized request argument supplied: {', '.join(unknown)}.", unknown[0]
    needed = REQUIRED[path]
    if needed not in body:
        return f"'{needed}' is required.", needed
    wrong = _types(path, body)
    if wrong:
        return wrong
    return None


def _types(path, body):
    for name in NUMBERS & set(body):
        if not _is_number(body[name]):
            return f"'{name}' must be a number, not {_kind(body[name])}.", name
    for name in WHOLE & set(body):
        value = body[name]
        if not (isinstance(value, int) and not isinstance(value, bool)) or value < 0:
            return f"'{name}' must be a whole number of 0 or more, not {value!r}.", name
    if "stream" in body and not isinstance(body["stream"], bool):
        return f"'stream' must be true or false, not {_kind(body['stream'])}.", "stream"
    if "stream_options" in body and not isinstance(body["stream_options"], (dict, type(None))):
        return "'stream_options' must be an object.", "stream_options"
    if path == "chat/completions":
        messages = body["messages"]
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            return "'messages' must be a list of objects, each with a 'role'.", "messages"
    if path == "completions" and not isinstance(body["prompt"], (str, list)):
        return "'prompt' must be a string or a list.", "prompt"
    if path == "embeddings" and not isinstance(body["input"], (str, list)):
        return "'input' must be a string or a list.", "input"
    return None


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kind(value):
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)
