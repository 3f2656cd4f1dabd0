"""One launch of each call inside the CUDA profiler's range, each in an NVTX range named after it:
what tools/device-run.sh's `ncu:` step profiles (`ncu --profile-from-start off --nvtx`). The calls
are made and warmed by the caller, outside the range."""


def profiled(launches) -> None:
    """launches: (name, call) pairs; each call launched once between cudaProfilerStart and Stop."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, call in launches:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
