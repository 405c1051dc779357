"""transformers' from_pretrained with nothing left out, for the checkers
that run in .venv-mcore (opt_check.py, llama_check.py)."""
import logging


def from_pretrained_strict(cls, mnt, **kwargs):
    """cls.from_pretrained(mnt, **kwargs), failing on any missing,
    unexpected or mismatched key and on any warning transformers logs
    about weights it did not find or had to initialise."""
    from transformers.utils import logging as hf_logging
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    keep = Keep(level=logging.WARNING)
    hf_logging.get_logger().addHandler(keep)
    try:
        model, info = cls.from_pretrained(mnt, local_files_only=True,
                                          output_loading_info=True, **kwargs)
    finally:
        hf_logging.get_logger().removeHandler(keep)
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys",
                "error_msgs"):
        assert not info[key], (key, info[key])
    assert not any("were not" in r or "newly initialized" in r
                   for r in records), records
    return model
