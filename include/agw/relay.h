#ifndef AGW_RELAY_H
#define AGW_RELAY_H
#endif
