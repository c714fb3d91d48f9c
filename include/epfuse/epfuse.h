// epfuse/epfuse.h: everything a user of epfuse includes.
#pragma once
#include "epfuse/communicator.h"
#include "epfuse/config.h"
#include "epfuse/error.h"
#include "epfuse/inputs.h"
#include "epfuse/layer.h"
#include "epfuse/reference.h"
#include "epfuse/types.h"
#include "epfuse/workspace.h"
