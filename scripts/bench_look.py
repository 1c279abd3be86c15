#!/usr/bin/env python3
"""Look again: a 10-photo chat that ends with a question about photo 1, three ways, in one run.

- edgevlm (default): every answered photo becomes its summary; the last question names "image 1",
  which comes back live for that turn from the projector-row cache, and is a summary again after;
- edgevlm with the summary alone: the same chat, the last question naming no photo;
- every photo live (`--keep-images 10`), as llama-server keeps a history's images until the
  context is full: the question sees photo 1's pixels, and every photo's tokens stay in the cache;
- the first and the last again with `--merge 0.25` (each image's visual tokens merged to a quarter
  after the projector);
- thumbnails (`--keep-thumbnails 64`): every answered photo stays as its summary and 64 merged
  tokens of itself, and the last question (naming no photo) sees all ten that way;
- llama-server itself (when `make peers` has built it), sent the same chat as a client sends it:
  each request the whole history with every photo, the last one the question about photo 1.
  Reported: the tokens it processed for the last request (its `timings.prompt_n`: what its cache
  did not hold), its TTFT (`timings.prompt_ms`), its peak prompt, and the request where the
  context ran out, if one did.

Each runs `edgevlm chat` piped, on the test models (their words mean nothing; token counts,
encodes and times are real), with the projector-row cache on in a fresh folder. Prints, for the
last turn: the tokens prefilled, CLIP encodes, TTFT, and the cache (visual tokens live, KV).

    python scripts/bench_look.py [--pair qwen|llava] [--photos 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_serve's llama-server helpers
MODELS = ROOT / "models" / "test"
PAIRS = {"qwen": ("qwen2vl-test.gguf", "mmproj-qwen2.5vl-test.gguf"),
         "llava": ("SmolLM2-135M-Instruct.Q4_1.gguf", "mmproj-test-112.gguf")}


def photos(folder: Path, n: int) -> list[Path]:
    """n distinct photos: each a colour and a numbered sign."""
    made = []
    for k in range(n):
        image = Image.new("RGB", (800, 600), ((37 * k) % 255, (91 * k + 60) % 255, (53 * k + 120) % 255))
        ImageDraw.Draw(image).text((300, 280), f"SIGN {k + 1}", fill=(255, 255, 255))
        made.append(folder / f"photo{k + 1:02d}.jpg")
        image.save(made[-1], quality=90)
    return made


def run(pair: str, shown: list[Path], last: str, folder: Path, *extra: str) -> dict[str, object]:
    text, mmproj = PAIRS[pair]
    stats = folder / f"stats-{len(list(folder.glob('stats-*')))}.jsonl"
    script = "".join(f"/image '{p}' what is this?\n" for p in shown) + f"{last}\n"
    env = {k: v for k, v in os.environ.items() if k != "EDGEVLM_NO_CACHE"}  # the projector rows: cached
    env["XDG_CACHE_HOME"] = str(folder / "cache")
    subprocess.run([sys.executable, "-m", "edgevlm", "chat", "--model", str(MODELS / text), "--mmproj",
                    str(MODELS / mmproj), "--n-ctx", "8192", "--max-tokens", "16", "--temperature", "0",
                    "--stats-json", str(stats), "--session", str(folder / f"{stats.stem}.session.jsonl"),
                    *extra], input=script, text=True, env=env, check=True, capture_output=True)
    rows = [json.loads(line) for line in stats.read_text().splitlines()]
    end = rows[-1]
    return {"prefill_tokens": end["prefill_tokens"], "clip_encodes": end["clip_encodes"],
            "ttft_s": end["ttft_s"], "visual_tokens": end["visual_tokens"],
            "visual_tokens_live": end["visual_tokens_live"], "kv_tokens": end["kv_tokens"],
            "shown_again": end.get("shown_again", []), "summary_wait_s": end["summary_wait_s"],
            "first_photo_ttft_s": rows[0]["ttft_s"], "peak_kv": max(r["kv_tokens"] for r in rows),
            "prefill_tokens_all_turns": sum(r["prefill_tokens"] for r in rows)}


def llama_server_run(pair: str, shown: list[Path], last: str) -> dict[str, object]:
    """The chat through llama-server: every request resends the history with every photo."""
    import base64

    from bench_serve import llama_server
    from openai import APIError

    text, mmproj = PAIRS[pair]
    history: list[dict[str, object]] = []
    out: dict[str, object] = {"ran_out_at": None, "peak_prompt": 0}
    with llama_server(MODELS / text, MODELS / mmproj, 8192) as (client, model):
        turns = [(p, "what is this?") for p in shown] + [(None, last)]
        for number, (photo, question) in enumerate(turns, start=1):
            content: list[dict[str, object]] = [{"type": "text", "text": question}]
            if photo is not None:
                url = "data:image/jpeg;base64," + base64.b64encode(photo.read_bytes()).decode()
                content.insert(0, {"type": "image_url", "image_url": {"url": url}})
            history.append({"role": "user", "content": content})
            try:
                reply = client.chat.completions.create(model=model, messages=history, max_tokens=16,
                                                       temperature=0)
            except APIError as exc:
                out["ran_out_at"] = f"request {number}: {str(exc).splitlines()[0][:160]}"
                break
            timings = (reply.model_extra or {}).get("timings") or {}
            out.update(prompt_tokens=reply.usage.prompt_tokens, processed=timings.get("prompt_n"),
                       ttft_s=timings.get("prompt_ms", 0.0) / 1000)
            out["peak_prompt"] = max(int(out["peak_prompt"]), reply.usage.prompt_tokens)
            history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="qwen")
    parser.add_argument("--photos", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--llama-server-only", action="store_true", help="only the llama-server run")
    args = parser.parse_args()
    if args.llama_server_only:
        print_llama_server(args.pair, args.photos)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shown = photos(folder, args.photos)
        results = {
            "look again (image 1)": run(args.pair, shown, "What did the sign in image 1 say?", folder),
            "summary only": run(args.pair, shown, "What did the sign say at the start?", folder),
            f"every photo live (--keep-images {args.photos})": run(
                args.pair, shown, "What did the sign in image 1 say?", folder,
                "--keep-images", str(args.photos)),
            "look again, --merge 0.25": run(args.pair, shown, "What did the sign in image 1 say?", folder,
                                            "--merge", "0.25"),
            "every photo live, --merge 0.25": run(
                args.pair, shown, "What did the sign in image 1 say?", folder,
                "--keep-images", str(args.photos), "--merge", "0.25"),
            "thumbnails (--keep-thumbnails 64)": run(args.pair, shown, "What did the sign say at the start?",
                                                     folder, "--keep-thumbnails", "64"),
        }
    if args.json:
        print(json.dumps({"pair": args.pair, "photos": args.photos, "runs": results}, indent=2))
        return
    print(f"{args.photos} photos on the {args.pair} test pair, then a question about photo 1 (last turn):")
    print(f"{'':44} {'prefill':>8} {'encodes':>8} {'TTFT s':>7} {'wait s':>7} {'visual':>7} {'live':>6} "
          f"{'KV':>6} {'peak KV':>8} {'all turns':>10}")
    look, live = results["look again (image 1)"], list(results.values())[2]
    for name, r in results.items():
        print(f"{name:44} {r['prefill_tokens']:>8} {r['clip_encodes']:>8} {r['ttft_s']:>7.3f} "
              f"{r['summary_wait_s']:>7.3f} {r['visual_tokens']:>7} {r['visual_tokens_live']:>6} "
              f"{r['kv_tokens']:>6} {r['peak_kv']:>8} {r['prefill_tokens_all_turns']:>10}")
    print(f"(the first photo's own turn: TTFT {look['first_photo_ttft_s']:.3f} s; 'wait': the last turn "
          "waited for an earlier photo's summary, apart from TTFT)")
    if live["kv_tokens"]:
        print(f"ratios: KV at the end {look['kv_tokens'] / live['kv_tokens']:.2f}x every-photo-live's; "
              f"last TTFT {look['ttft_s'] / max(live['ttft_s'], 1e-9):.2f}x")
    from bench_serve import LLAMA_SERVER

    if not LLAMA_SERVER.exists():
        print("llama-server: not built (`make peers`)")
        return
    print_llama_server(args.pair, args.photos)


def print_llama_server(pair: str, n_photos: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        peer = llama_server_run(pair, photos(Path(tmp), n_photos), "What did the sign in image 1 say?")
    ttft = float(peer.get("ttft_s") or 0)
    print(f"llama-server, every photo resent each request: last request {peer.get('prompt_tokens')} prompt "
          f"tokens, {peer.get('processed')} processed, TTFT {ttft:.3f} s; peak prompt "
          f"{peer['peak_prompt']} (-c 8192 asked; llama-server caps a slot at the model's trained context); "
          f"ran out of context: {peer['ran_out_at'] or 'no'}")


if __name__ == "__main__":
    main()
