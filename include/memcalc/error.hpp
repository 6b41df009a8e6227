#pragma once
/// memcalc::error: the one exception the core throws. Its message names the field and the value,
/// so the program can print it as one line and exit non-zero.
#include <stdexcept>
#include <string>

namespace memcalc {

class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// A count that does not fit in 64 bits; callers that know which input caused it rethrow it as an
/// error naming that input.
class overflow_error : public error {
public:
    using error::error;
};

}  // namespace memcalc
