"""Images in prompts: found per dialect in template order, carried by samples, runs located."""

from __future__ import annotations

import base64
import hashlib
import io

from PIL import Image

from orchard_rec.dialects import images_of
from orchard_rec.dialects.images import decode_data_url
from orchard_rec.reconstruct import Sample, image_runs, reconstruct_session
from orchard_rec.records import Dialect
from tests.factories import call, data_url

PAD = 99


def png(color: tuple[int, int, int], size: tuple[int, int] = (112, 84)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


A, B, C, D = png((255, 0, 0)), png((0, 255, 0), (224, 168)), png((0, 0, 255)), png((9, 9, 9))


def test_images_of_each_dialect_in_prompt_order() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "s"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "x"},
                    {"type": "image_url", "image_url": {"url": data_url(A)}},
                ],
            },
            {"role": "assistant", "content": "ok"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(B)}},
                    {"type": "image_url", "image_url": {"url": "https://h/x.png"}},
                ],
            },
        ]
    }
    refs = images_of(Dialect.CHAT, chat)
    assert [r.digest for r in refs[:2]] == [hashlib.sha256(A).hexdigest(), hashlib.sha256(B).hexdigest()]
    assert (refs[0].width, refs[0].height, refs[0].mime) == (112, 84, "image/png")
    assert (refs[1].width, refs[1].height) == (224, 168)
    assert refs[0].data == A and refs[2].url == "https://h/x.png" and refs[2].data is None

    responses = {
        "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": data_url(C)}]},
            {
                "type": "function_call_output",
                "call_id": "c",
                "output": [{"type": "input_image", "image_url": data_url(A)}],
            },
        ]
    }
    assert [r.data for r in images_of(Dialect.RESPONSES, responses)] == [C, A]

    b64 = base64.b64encode(D).decode()
    messages = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": base64.b64encode(B).decode(),
                                },
                            }
                        ],
                    }
                ],
            },
        ]
    }
    assert [r.data for r in images_of(Dialect.MESSAGES, messages)] == [D, B]
    assert images_of(Dialect.COMPLETIONS, {"prompt": "x"}) == []
    assert decode_data_url("data:image/png;base64,!!!") is None or True  # never raises
    assert decode_data_url("https://x") is None


def _chat(*images: bytes) -> dict:
    return {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images],
            }
        ]
    }


def test_samples_carry_their_images_and_spans_and_split_when_screenshots_drop() -> None:
    # turn 1 shows A, turn 2 extends with B; turn 3 drops A (keeps the last one): the prefix breaks
    p1 = [1, PAD, PAD, PAD, 2]
    c1 = [5, 6]
    p2 = p1 + c1 + [3, PAD, PAD, 4]
    c2 = [7]
    p3 = [1, PAD, PAD, 4, 8]
    c3 = [9]
    calls = [
        call(prompt_ids=p1, completion_ids=c1, logprobs=[-0.1, -0.2], request=_chat(A), received_at=1.0),
        call(prompt_ids=p2, completion_ids=c2, logprobs=[-0.3], request=_chat(A, B), received_at=2.0),
        call(prompt_ids=p3, completion_ids=c3, logprobs=[-0.4], request=_chat(B), received_at=3.0),
    ]
    samples = reconstruct_session(calls)
    assert len(samples) == 2
    first, second = samples
    assert [im.data for im in first.images] == [A, B]
    assert [im.data for im in second.images] == [B]
    assert second.metadata["images_dropped"] == 1 and second.metadata["reason"] == "mismatch"
    for s in samples:  # image runs are observation: mask 0
        pads = [i for i, t in enumerate(s.response_ids) if t == PAD]
        assert all(s.loss_mask[i] == 0 for i in pads)

    from orchard_rec.reconstruct import reconstruct
    from orchard_rec.reconstruct.generation import generations_of

    gens, _ = generations_of(calls)
    s1, s2 = reconstruct(gens, session_id="s1", image_token=PAD)
    assert s1.metadata["image_spans"] == [[1, 4], [8, 10]] and "image_spans_mismatch" not in s1.metadata
    assert s2.metadata["image_spans"] == [[1, 3]]
    row = s1.to_dict()
    assert [i["digest"] for i in row["images"]] == [
        hashlib.sha256(A).hexdigest(),
        hashlib.sha256(B).hexdigest(),
    ]
    back = Sample.from_dict(row)
    assert back.images == s1.images  # bytes are not part of the row (exporters write them)


def test_image_runs() -> None:
    assert image_runs([PAD, PAD, 1, PAD, 2, PAD], PAD) == [[0, 2], [3, 4], [5, 6]]
    assert image_runs([1, 2], PAD) == []
