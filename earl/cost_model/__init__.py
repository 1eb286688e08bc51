"""earl.cost_model"""
