#ifndef AGW_GATEWAY_H
#define AGW_GATEWAY_H
#endif
