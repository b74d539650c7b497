#pragma once
// The message of the error a call throws, for tests of error messages.
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <utility>

#include "leantrain/runtime/errors.h"

namespace lt_test {

/// The message of what `f` throws as E, or "" (with a test failure) when it throws nothing or another type.
template <class E, class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "threw nothing";
  return "";
}

/// The message of the lt::ConfigError `f` throws.
template <class F>
std::string config_error(F&& f) {
  return error_of<lt::ConfigError>(std::forward<F>(f));
}

}  // namespace lt_test

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)
