"""Does the trainer compute what the sampler did? A log-prob check of exported samples.

The strongest proof that a sample is right: teacher-forced on the sample's tokens, the trainer's
model gives the same log-probs the sampler recorded, on every position the mask trains. A mask
one position off, a wrong prompt or a dropped template token shows up as a large difference;
what remains measures the training-inference mismatch (the KL that truncated importance
sampling corrects for).

Owns: the comparison (``compare``: ``check_sample`` / ``check_batch``, pure Python, for a
trainer's own log-probs), the Hugging Face scorer (``scorer``: torch and transformers imported
when it is made), the sample sources (``sources``: export files, the database) and the loop
(``run``) behind ``orchard-rec verify``. May import ``reconstruct``, ``exporters`` (readers),
``pipeline`` and ``errors``; the CLI imports this package only when ``verify`` runs.
"""

from orchard_rec.verify.compare import (
    DEFAULT_MAX_OVER,
    SampleCheck,
    SampleView,
    VerifyReport,
    check_batch,
    check_sample,
    sample_view,
)

__all__ = [
    "DEFAULT_MAX_OVER",
    "SampleCheck",
    "SampleView",
    "VerifyReport",
    "check_batch",
    "check_sample",
    "sample_view",
]
