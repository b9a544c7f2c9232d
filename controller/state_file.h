// The controller's state file on disk: read at start, rewritten atomically after every change.
#pragma once

#include <string>

#include "ina/base/status.h"

namespace ina::ctl {

// The file's text; kNotFound when it does not exist, another error (naming the path and the
// reason) when it exists but cannot be read.
Result<std::string> read_state_file(const std::string& path);

// Replaces `path` with `text` so that a crash leaves the old or the new file, never a part of
// one: writes PATH.tmp in the same directory, fsyncs it, renames it over PATH, fsyncs the
// directory. Errors name the file and the reason (strerror).
Status write_file_atomic(const std::string& path, const std::string& text);

// Whether write_file_atomic(path, ...) could succeed, without writing anything: the directory
// exists and is writable and `path` is not a directory. The errors read as write_file_atomic's
// would (--check-config and a real start refuse the same paths with the same words).
Status check_writable(const std::string& path);

}  // namespace ina::ctl
