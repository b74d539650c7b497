#pragma once
// The whole data layer: readers, sampling and datasets.
#include "leantrain/data/dataset.h"
#include "leantrain/data/readers.h"
#include "leantrain/data/registry.h"
#include "leantrain/data/sampling.h"
