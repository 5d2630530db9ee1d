"""The overrides of a small, quick real pipeline run, shared by the flow, deployment and
recording tests: 600 real reviews, hashed n-grams in 2^16 buckets, one epoch."""

SMALL_RUN = [
    "fetch.limit=600",
    "prepro.max_len=64",
    "train.ngram_buckets=65536",
    "train.max_epoch=1",
    "export.num_samples=16",
]
