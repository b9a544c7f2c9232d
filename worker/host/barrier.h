// Barrier: returns on a rank once every rank has entered it.
#pragma once

#include "ina/base/status.h"
#include "worker/host/context.h"

namespace ina::host {

Status barrier(Context& ctx);

}  // namespace ina::host
