"""Which expert answers a sample: the Router interface (router.py) and its routers (prototypes, class routers, oracle), k-means prototypes, the evaluation cache."""
