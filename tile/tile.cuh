// The metapipe Hopper tile layer: include this one header in a .cu file built for sm_90a.
#pragma once
#include "tile/layout.h"
#include "tile/pipeline.cuh"
#include "tile/sync.cuh"
#include "tile/tma.cuh"
#include "tile/types.cuh"
#include "tile/warp.cuh"
#include "tile/warpgroup.cuh"
