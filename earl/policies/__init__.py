"""earl.policies"""
