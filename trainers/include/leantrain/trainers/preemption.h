#pragma once
// Preemption: SIGTERM and SIGUSR1 set a flag the training loop reads once per optimizer step
// (all ranks agree through the step's loss all-reduce), then it checkpoints and stops (exit
// code 75 from the command line). Torch-free.

namespace lt::trainers {

/// Installs the handlers of SIGTERM and SIGUSR1 (Trainer::run does, once per run).
void install_preemption_handlers();
/// Whether one of those signals arrived.
bool preemption_requested();
/// The signal that arrived; 0 for none.
int preemption_signal();

}  // namespace lt::trainers
