"""The stream tap: whole events passed on as they complete, usage read (and dropped when the
client did not ask), content events counted for billing a stream cut short."""
import json

from llmgw.web.usage_stream import UsageTap


def event(obj, sep="\n\n"):
    return f"data: {json.dumps(obj)}{sep}".encode()


def chunk(text):
    return event({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": text}}]})


USAGE = event({"object": "chat.completion.chunk", "choices": [],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
DONE = b"data: [DONE]\n\n"


def test_events_split_anywhere_come_out_whole_and_in_order():
    stream = ROLE + chunk("Hel") + chunk('lo "content": "x"') + USAGE + DONE
    for size in (1, 7, 64, len(stream)):
        tap = UsageTap(client_wants_usage=True)
        out = b"".join(tap.feed(stream[i:i + size]) for i in range(0, len(stream), size)) + tap.flush()
        assert out == stream
        assert tap.content_events == 2 and tap.usage["completion_tokens"] == 2 and tap.done


def test_the_usage_event_is_dropped_when_the_client_did_not_ask_but_still_read():
    tap = UsageTap(client_wants_usage=False)
    out = tap.feed(chunk("a") + USAGE + DONE)
    assert out == chunk("a") + DONE
    assert tap.usage["total_tokens"] == 5


def test_crlf_separated_events_and_usage_null_in_every_chunk():
    tap = UsageTap(client_wants_usage=False)
    body = event({"choices": [{"delta": {"content": "x"}}], "usage": None}, "\r\n\r\n")
    out = tap.feed(body + b"data: [DONE]\r\n\r\n")
    assert out == body + b"data: [DONE]\r\n\r\n"
    assert tap.content_events == 1 and tap.usage is None and tap.done


def test_an_empty_delta_or_a_stream_without_done_is_seen_as_such():
    tap = UsageTap(client_wants_usage=True)
    tap.feed(ROLE + event({"choices": [{"delta": {}, "finish_reason": "length"}]}))
    assert tap.content_events == 0 and not tap.done
