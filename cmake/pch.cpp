// Compiles the precompiled LibTorch header that every LibTorch target reuses.
