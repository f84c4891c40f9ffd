#pragma once
// One problem of a JobSpec: its field path relative to JobSpec ("training.learning_rate",
// "dataset.paths[1]") and what is wrong with it. CreateJob returns them as google.rpc.BadRequest
// field violations. Checker collects them for the job validator and the training rules.

#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::daemon {

struct FieldViolation {
  std::string field;
  std::string description;
};

// Appends violations to a list it does not own. Not thread-safe.
class Checker {
 public:
  explicit Checker(std::vector<FieldViolation>* out) : out_(out) {}
  void Add(const std::string& field, const std::string& description) {
    out_->push_back({field, description});
  }
  // Adds the status's message under `field` when it is an error; true then.
  bool Fails(const std::string& field, const Status& s) {
    if (s.ok()) return false;
    Add(field, s.message());
    return true;
  }
  // NaN is outside every range (the comparisons are written so that it fails them).
  template <typename T>
  void Range(const std::string& field, T value, T lo, T hi, bool lo_open = false) {
    if (!(value >= lo && value <= hi) || (lo_open && value == lo)) {
      std::ostringstream o;
      o << "must be in " << (lo_open ? "(" : "[") << lo << ", " << hi << "], got " << value;
      Add(field, o.str());
    }
  }

 private:
  std::vector<FieldViolation>* out_;
};

}  // namespace offloadd::daemon
