// Umbrella header of the tnt-comm C++ API.
#pragma once

#include "tnt_comm/build_info.hpp"
#include "tnt_comm/fused_allreduce.hpp"
#include "tnt_comm/fusion.hpp"
#include "tnt_comm/group.hpp"
#include "tnt_comm/identity.hpp"
#include "tnt_comm/runtime.hpp"
#include "tnt_comm/store.hpp"
#include "tnt_comm/timeline.hpp"
#include "tnt_comm/types.hpp"
#include "tnt_comm/work.hpp"
