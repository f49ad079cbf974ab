"""OpenCL rungs, one module per rung (``kNN_<name>.py`` + ``kNN_<name>.cl``), each with ``SPEC``.

The ladder and its ids are the CUDA ladder's, written in OpenCL C: the model of Numba's former ROC
(AMD HSA) target
(Numba's old ROC/HSA target: ``get_global_id``/``get_local_id``, work-group local memory,
``barrier``) is OpenCL's. Conventions every rung follows:

- ``build(params, dtype)`` returns a :class:`tilegemm.backends.opencl_program.OpenCLProgram`
  (source file, ``-D`` defines, work-group geometry). It imports no OpenCL library; the
  backend compiles per device.
- Parameters reach the kernel as ``-D`` defines with their own names (``-DTILE=16``);
  the element type is ``T`` (``-DTG_T=float``), declared by ``_prelude.cl``, which also
  holds the shared kernel signature ``GEMM_ARGS`` and the C-store macro ``STORE_C``.
- Any M, N, K: bounds on every edge; no work-item leaves before a barrier; C is read only
  when ``beta != 0``; the batch index is dimension 2.
- ``device_defaults`` may hold parameter defaults per OpenCL device type
  ("cpu", "gpu"), measured data that replaces the GPU-minded defaults on that kind of
  device (see docs/opencl.md).
"""
