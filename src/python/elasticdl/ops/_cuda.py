"""GPU dispatch (filled in with the CUDA backend)."""


def any_on_gpu(arrays) -> bool:
    return any(hasattr(a, "__cuda_array_interface__") for a in arrays)
