#pragma once
// The data `offloadctl convert` (config_convert.h) reads other tools' keys with: why a key offloadd
// has no setting for is dropped, and which group it is reported in; the chat templates that
// Axolotl and LLaMA-Factory name (client/templates/, compiled into the binary). Thread-safe.

#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::client::convert {

// How a dropped key is reported. kTrains: listed one by one, since the run would differ from
// theirs. kOperational: how their run is driven (data loading, saving, evaluation cadence), one
// line of names. kInternal: library internals and reporting (_n_gpu, ray_scope, Liger kernels,
// attn_implementation, logging, hub, report_to), only counted.
enum class Group { kTrains, kOperational, kInternal };

struct Reason {
  const char* prefix;
  const char* why;
  Group group = Group::kTrains;
};

// The reason for `key` (by name or prefix; the first match wins), or "offloadd has no such
// setting" in kTrains.
const Reason& ReasonFor(const std::string& key);

// A named chat template: Axolotl's `chat_template` names and LLaMA-Factory's `template` names
// resolve to the template text offloadd writes beside the job file. `*note` says how a name read
// (an alias). NOT_FOUND naming the known names otherwise.
StatusOr<std::string> NamedChatTemplate(const std::string& name, std::string* note);
std::string KnownTemplateNames();

// "owner/name" that is not a file or directory here: a Hugging Face Hub id.
bool LooksLikeHubId(const std::string& value);

}  // namespace offloadd::client::convert
