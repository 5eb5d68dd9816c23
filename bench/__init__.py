"""The routing benchmark: simulator replicas, routers under test, an open-loop load generator."""
