#include "ina/protocol/quantize.h"
