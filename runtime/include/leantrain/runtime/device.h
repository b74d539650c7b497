#pragma once
// The LibTorch device a RuntimeContext computes on (runtime_context.h stays torch-free).
#include <c10/core/Device.h>

#include "leantrain/runtime/runtime_context.h"

namespace lt {

/// cuda:<device_index> on a GPU, else the CPU.
inline c10::Device device_of(const RuntimeContext& ctx) {
  return ctx.on_cuda() ? c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(ctx.device_index))
                       : c10::Device(c10::DeviceType::CPU);
}

}  // namespace lt
