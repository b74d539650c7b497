"""Python side of leantrain checkpoint interop.

- reference_models: PyTorch re-implementations of leantrain's gpt / bert / resnet / mlp whose
  parameter and buffer names equal the C++ named_parameters() / named_buffers() names.
- checkpoint: reads and verifies leantrain HDF5 checkpoints (format version 1) with h5py.
- export: `python -m leantrain_py.export CKPT OUT.pt` (a torch.save'd state_dict).
- check_outputs: `python -m leantrain_py.check_outputs CKPT IO.h5 [--tol 1e-5]`.
"""
