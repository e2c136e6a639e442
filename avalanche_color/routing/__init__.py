"""Which expert answers a sample: the routers behind one interface (routers.py: prototypes, oracle, class routers) over the closed-form classifiers the class routers fit (classifiers.py)."""
