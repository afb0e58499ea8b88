// EXPECT_USER_ERROR(statement, "substring"): the statement must throw mp::user_error whose message
// contains the substring (the error tests assert what the user is told, not just that something failed).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

#define EXPECT_USER_ERROR(stmt, substr)                                             \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "expected a user_error containing: " << substr;              \
    } catch (const mp::user_error& e) {                                             \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)
