"""A small CNN trained with PyTorch, deterministic for a seed: the unmodified trainer that
bench/gpu-check.sh runs with and without libwavelet.so preloaded (the losses must match).

Synthetic Fashion-MNIST-shaped data (the GPU machine has no dataset and no network); the wave
is real: activations are allocated in forward and freed in backward by PyTorch's allocator.
Prints one line per step: `step N loss X` with X in full precision (repr), then `samples_per_s`
over the steps after the first --warmup ones (their start-up: CUDA's lazy loading, cuDNN's
set-up), `timed_window START END SAMPLES` (those steps' wall-clock bounds), then `done`.
"""
import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=64, help="channels of the first conv")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--graph", action="store_true",
                    help="capture one training step as a CUDA graph (PyTorch's default GLOBAL "
                         "capture mode) after 3 warm-up steps, and replay it")
    ap.add_argument("--warmup", type=int, default=0,
                    help="steps left out of samples_per_s (they still train and print)")
    args = ap.parse_args()
    if args.steps < 1 or args.batch < 1 or args.width < 1:
        print("torch_cnn: --steps, --batch and --width must be positive", file=sys.stderr)
        return 2
    if args.warmup < 0 or args.warmup >= args.steps:
        print(f"torch_cnn: --warmup {args.warmup}: expected 0 to --steps - 1 ({args.steps - 1})",
              file=sys.stderr)
        return 2

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.nn as nn

    if not torch.cuda.is_available():
        print("torch_cnn: no CUDA device", file=sys.stderr)
        return 77
    torch.manual_seed(args.seed)
    # Warn, not raise, where an op has no deterministic CUDA kernel in this PyTorch: the run
    # still finishes, and the loss comparison shows whether it mattered.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False

    w = args.width
    model = nn.Sequential(
        nn.Conv2d(1, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * w * 7 * 7, 256), nn.ReLU(), nn.Linear(256, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    g = torch.Generator().manual_seed(args.seed)
    # A fixed pool of batches, so every step's input is the same in every run.
    xs = torch.randn(8, args.batch, 1, 28, 28, generator=g)
    # Labels depend on the input so the loss can fall.
    ys = (xs.mean(dim=(2, 3, 4)) * 40).long().remainder(10)

    t0 = time.perf_counter()
    w0 = time.time()  # the timed window's start on the wall clock, which replicas share
    if args.graph:
        # The whole-step capture of PyTorch's CUDA-graph recipe: static inputs, warm-up on a side
        # stream (which also makes the optimizer's state), capture, then copy and replay. Inside
        # the capture PyTorch's allocator takes new memory with cudaMalloc in RELAXED mode.
        sx = xs[0].cuda()
        sy = ys[0].cuda()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                loss_fn(model(sx), sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = loss_fn(model(sx), sy)
            static_loss.backward()
            opt.step()
        for step in range(args.steps):
            if step == args.warmup and step:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                w0 = time.time()
            sx.copy_(xs[step % 8])
            sy.copy_(ys[step % 8])
            graph.replay()
            print(f"step {step} loss {static_loss.item()!r}", flush=True)
    else:
        for step in range(args.steps):
            if step == args.warmup and step:
                torch.cuda.synchronize()  # the timed steps start from an idle GPU
                t0 = time.perf_counter()
                w0 = time.time()
            x = xs[step % 8].cuda(non_blocking=True)
            y = ys[step % 8].cuda(non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            print(f"step {step} loss {loss.item()!r}", flush=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(f"samples_per_s {(args.steps - args.warmup) * args.batch / dt:.1f}", flush=True)
    # Wall-clock bounds of the timed steps and their samples: replicas' rates add up only over
    # the time they trained together (total samples over the union of their windows).
    print(f"timed_window {w0:.6f} {time.time():.6f} {(args.steps - args.warmup) * args.batch}",
          flush=True)
    print(f"max_allocated {torch.cuda.max_memory_allocated()}", flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
