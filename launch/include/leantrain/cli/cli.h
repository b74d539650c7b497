#pragma once
// leantrain's command line as a library (leantrain::cli). A program of one's own registers its
// model and data kinds, then hands over to the same command line the `leantrain` executable is:
//
//   #include "leantrain/cli/cli.h"
//   #include "leantrain/models/registry.h"
//
//   int main(int argc, char** argv) {
//     lt::models::register_model(my_model_kind());  // [model] kind = "my_model"
//     lt::data::register_data(my_data_kind());      // [data] kind = "my_data"
//     return lt::cli::main(argc, argv);
//   }
//
// and gets every subcommand (train, plan, inspect, export, report, options; --auto,
// --init-from, --resume), with its kinds beside the built-ins in `options`, `plan`, config.json
// and error messages, and leantrain's exit codes (docs/ERRORS.md) and behaviour under mpirun.
// examples/custom_model is such a program.
#include <exception>
#include <string>

namespace lt::comm {
class Communicator;
}

namespace lt::cli {

/// Runs the command line: parses argv, runs the subcommand, and returns the exit code (never
/// throws, never calls exit). Messages start with the program's name (argv[0]'s file name).
int main(int argc, char** argv);

/// For a program that drives lt::trainers::Trainer itself: call inside a catch block. Prints
/// one line ("<program>: config error: ..."), classified by the one table (lt::classify_error);
/// when the error is this rank's alone and `comm` spans several ranks, ends the whole job at
/// once with the error's code (Note [Errors on one rank], runtime/src/errors.cpp) instead of
/// leaving the other ranks waiting. Returns the exit code for main() to return.
int handle_current_exception(const std::string& program, comm::Communicator* comm = nullptr);

}  // namespace lt::cli
