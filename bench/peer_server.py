"""The peer of ``xdpx serve --http`` for a fine-tuned encoder: FastAPI + a ``transformers``
text-classification pipeline, the way a user serves a Hugging Face model without xdpx.

One worker (uvicorn), PyTorch eager on CPU with ``--threads`` intra-op threads, one pipeline
call per request (no batching across requests). ``POST /predict`` takes the body that
``xdpx serve`` takes (``{"texts": [...]}``) and answers ``{"labels": [...],
"probabilities": [[p_label1, ...], ...], "label_names": [...]}`` (probabilities in the
order of ``config.id2label``). ``GET /health`` answers 200 once the model is loaded.

The handler is ``async`` and calls the pipeline on the event loop, so calls run one at a
time, each with all ``--threads``. A plain ``def`` handler (FastAPI's thread pool, up to
40 calls at once) is the other common way (``--sync``); it oversubscribes the cores.

``--model`` is a ``save_pretrained`` directory (config.json, model.safetensors and the
tokenizer files); ``bench/serve_encoder.py`` writes one from an xdpx hf_classifier
checkpoint (the same weights). ``--transliterate pinyin`` applies the run's
``prepro.transliterate`` to each text first, as a user of that model must (MiniLM's
vocabulary has no Chinese characters; ``params/bert-minilm.yaml``).

Usage::

    python bench/peer_server.py --model /tmp/hf-model --port 8100 --threads 2 --max-length 128
"""

from __future__ import annotations

import argparse
import os

from pydantic import BaseModel


class Body(BaseModel):
    """``POST /predict``'s body (as ``xdpx serve``'s)."""

    texts: list[str]


def build_app(model_dir: str, threads: int, max_length: int, transliterate: str | None, sync: bool):
    """The FastAPI app serving ``model_dir`` with a text-classification pipeline."""
    import torch
    from fastapi import FastAPI
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, local_files_only=True)
    pipe = pipeline("text-classification", model=model, tokenizer=tokenizer, device="cpu")
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    prepare = None
    if transliterate:
        from xdpx.data.transliterate import make_transliterator

        prepare = make_transliterator(transliterate)

    def answer(body: Body) -> dict:
        texts = [prepare(t) for t in body.texts] if prepare else body.texts
        out = pipe(texts, top_k=None, truncation=True, max_length=max_length)
        probs = [[{d["label"]: d["score"] for d in row}[n] for n in names] for row in out]
        labels = [names[max(range(len(p)), key=p.__getitem__)] for p in probs]
        return {"label_names": names, "labels": labels, "probabilities": probs}

    app = FastAPI(title="peer: transformers pipeline")

    @app.get("/health")
    async def health() -> dict:
        return {"ready": True}

    if sync:

        @app.post("/predict")
        def predict_sync(body: Body) -> dict:
            return answer(body)
    else:

        @app.post("/predict")
        async def predict(body: Body) -> dict:
            return answer(body)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--model", required=True, help="save_pretrained dir (model + tokenizer)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads")
    parser.add_argument("--max-length", type=int, default=512, help="truncate texts (tokens)")
    parser.add_argument("--transliterate", help="apply xdpx's transliteration first (pinyin)")
    parser.add_argument("--sync", action="store_true", help="a def handler (thread pool)")
    args = parser.parse_args()
    import uvicorn

    app = build_app(args.model, args.threads, args.max_length, args.transliterate, args.sync)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", workers=1)


if __name__ == "__main__":
    main()
