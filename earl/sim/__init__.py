"""earl.sim"""
